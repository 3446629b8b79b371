"""A pairwise preference function for the group-reward tests: the longer text wins, with
probability len(a) / (len(a) + len(b)) (a half for two empty texts)."""


def longer(a, b):
    total = len(a) + len(b)
    return 0.5 if total == 0 else len(a) / total
