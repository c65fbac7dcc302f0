"""Google Cloud Storage credentials. (Being built: foundation issue.)"""
