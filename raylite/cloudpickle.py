"""`ray.cloudpickle`: the cloudpickle package under raylite's name, for code that pickles functions
and classes by value as Ray code does; a module of its own so `import raylite` stays free of it."""
from pickle import PicklingError  # noqa: F401 - Ray's ray.cloudpickle exposes it too

from cloudpickle import *  # noqa: F401,F403
from cloudpickle import __all__, __version__  # noqa: F401
