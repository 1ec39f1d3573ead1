"""``ray.train.v2.api``: see ``raylite.train.v2``."""
