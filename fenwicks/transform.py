"""Augmentations, per example and vectorised over a batch. (Being built: input issue.)"""
