"""dice_jax's data, reward and verifier-client modules stay free of torch and of the verifier's code
(ARCHITECTURE.md, "The verifier's trust boundary")."""

import subprocess
import sys

MODULES = ["dice_jax.data.problems", "dice_jax.data.prompts", "dice_jax.data.extract",
           "dice_jax.data.rl_data", "dice_jax.rewards.shaping", "dice_jax.rewards.defaults",
           "dice_jax.rewards.candidates", "dice_jax.rewards.outcomes", "dice_jax.verifier.client",
           "dice_jax.verifier.sync_client", "dice_jax.verifier.connect", "dice_jax.verifier.local",
           "dice_jax.verifier.options"]


def test_no_torch_or_verifier_service_imported():
  code = (f"import sys\nfor m in {MODULES!r}: __import__(m)\n"
          "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'verifier_service'))\n"
          "print(bad)\nsys.exit(1 if bad else 0)\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
