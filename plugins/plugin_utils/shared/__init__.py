"""Shared by every stage: the error type, the package data files, text and size helpers."""
