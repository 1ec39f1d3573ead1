"""Ray Train v2's import paths (``ray.train.v2.api...``, used by Ray's docs), for code written
against them; the classes are raylite.train's own."""
