"""The recipe as typed data: its sections (`sections`, `algorithm`), parsing and overrides (`parse`),
recipe lookup (`recipes`) and the help of every key (`help`). Imports only the leaves (errors, registry).
"""
