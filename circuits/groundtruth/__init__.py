"""Ground truths: the AF1 search and head pruning run on the zoo's planted models and scored against what was
planted (:mod:`.recovery`; ``af1 groundtruth``), and the table, figures and report of that comparison
(:mod:`.report`). The public names of :mod:`.recovery` are importable from here, as before the move.

May import everything below it: the analyses (search, prune), the runner, the zoo, prompts, models and store.
"""

from circuits.groundtruth.recovery import *  # noqa: F403
from circuits.groundtruth.recovery import __all__  # noqa: F401
