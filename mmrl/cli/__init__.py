"""The commands (train, eval, demo, sweep, export, explain, list); no library module defines one.
"""
