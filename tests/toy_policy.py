"""A toy write policy, all in this file: `off`'s writes (every row to the cache, rejected ones left
there), declaring a different state counterpart: beside it a hybrid model's recurrent state is kept
by `snapshots` (a state per window position), not by `off`. Registering it is one line:

    register_policy("toy", ToyPolicy)

(tests/test_toy_policy.py does, and shows it reaching the CLI, the benches and the engine)."""
from nwor_lab.policies import OffPolicy


class ToyPolicy(OffPolicy):
    """Write-all, like `off`: the attention masks rejected rows, so greedy tokens stay the target's."""

    state_counterpart = "snapshots"
