"""Colab helpers kept for ports of original-Fenwicks notebooks. (Being built.)"""
