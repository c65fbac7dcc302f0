"""Plots for notebooks (matplotlib imported on use). (Being built: tutorials issue.)"""
