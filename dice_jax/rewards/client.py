"""The verifier client moved to dice_jax.verifier.client; this name is an alias of that module.

Kept only because tests/verifier/test_verifier_cli.py (owned by the verifier side) still imports
`dice_jax.rewards.client`; delete this file once that import reads `dice_jax.verifier.client`.
"""

import sys

from dice_jax.verifier import client as _client

sys.modules[__name__] = _client
