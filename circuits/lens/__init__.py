"""Early decoding (logit lens) after every attention and MLP sub-layer, and the attention interchange check.

Early decoding reads the residual stream at the **last prompt position** after each sub-layer of every
block (0-indexed) and projects it to the vocabulary as if it were the final state. The interchange
check patches the last-position attention output of one block from a counterfactual prompt and
measures the drop of the original answer's probability.

Modules, one concern each (every public name is re-exported here, so ``from circuits.lens import X``
works for all of them):

* :mod:`~circuits.lens.numeric`: which vocabulary ids are numbers and operators (:func:`numeric_table`).
* :mod:`~circuits.lens.capture`: which hooks hold the state after each sub-layer, and the capture of
  last-position states with scoped hooks (:func:`lens_states`).
* :mod:`~circuits.lens.inputs`: prompts grouped by layout, answer token ids (:func:`answer_token_id`).
* :mod:`~circuits.lens.decode`: decoding conventions and metrics, :func:`early_decode`.
* :mod:`~circuits.lens.result`: :class:`LensResult`, its summary rows and :func:`json_ready`.
* :mod:`~circuits.lens.interchange`: :func:`interchange` and :class:`InterchangeResult`.
* :mod:`~circuits.lens.counterfactual`: counterfactual prompt pairs from the task's own arithmetic
  (:class:`circuits.tasks.TaskSpec`).
* :mod:`~circuits.lens.report`: ``lens.json`` and the offline HTML report (the only module that writes
  files; import it as ``circuits.lens.report``).

Every analysis streams over batches and keeps only the last-position vectors of the hooks it reads.
"""

from __future__ import annotations

from .capture import SUBLAYERS, block_list, capture_last, lens_states, sublayer_hooks, sublayers_of
from .counterfactual import CounterfactualSet, counterfactual_rows, counterfactual_set, parse_operands
from .decode import decode_states, early_decode
from .inputs import PromptGroup, answer_token_id, prompt_groups
from .interchange import InterchangeResult, interchange
from .numeric import OPERATOR_TEXTS, NumericTable, numeric_table
from .result import METRICS, LensResult, json_ready

__all__ = [
    "METRICS", "SUBLAYERS", "OPERATOR_TEXTS", "NumericTable", "numeric_table", "LensResult",
    "early_decode", "decode_states", "lens_states", "sublayer_hooks", "sublayers_of", "capture_last",
    "block_list", "InterchangeResult", "interchange", "CounterfactualSet", "counterfactual_rows",
    "counterfactual_set", "parse_operands", "answer_token_id", "PromptGroup", "prompt_groups", "json_ready",
]
