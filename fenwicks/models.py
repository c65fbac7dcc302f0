"""Ready-made networks. (Being built: building-blocks issue.)"""
