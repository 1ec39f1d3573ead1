"""raylite's runtime, in layers, lowest first: wire, hardware, envs, client, worker, node, api. A layer
imports only itself and the layers below it (tests/project/test_import_contract.py holds the order); users
import from raylite, not from here, so paths inside may change."""
