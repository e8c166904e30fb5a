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
* :mod:`~circuits.lens.interchange_check`: :func:`interchange` and :class:`InterchangeResult`.
* :mod:`~circuits.lens.counterfactual`: counterfactual prompt pairs from the task's own arithmetic
  (:class:`circuits.tasks.TaskSpec`).
* :mod:`~circuits.lens.report`: ``lens.json`` and the offline HTML report (the only module that writes
  files; import it as ``circuits.lens.report``).

Every analysis streams over batches and keeps only the last-position vectors of the hooks it reads.
"""

from circuits.lazy import exports

__all__ = [
    "METRICS", "SUBLAYERS", "OPERATOR_TEXTS", "NumericTable", "numeric_table", "LensResult",
    "early_decode", "decode_states", "lens_states", "sublayer_hooks", "sublayers_of", "capture_last",
    "block_list", "InterchangeResult", "interchange", "CounterfactualSet", "counterfactual_rows",
    "counterfactual_set", "parse_operands", "answer_token_id", "PromptGroup", "prompt_groups", "json_ready",
]

__getattr__ = exports(__name__, {
    "SUBLAYERS": "circuits.lens.capture",
    "block_list": "circuits.lens.capture",
    "capture_last": "circuits.lens.capture",
    "lens_states": "circuits.lens.capture",
    "sublayer_hooks": "circuits.lens.capture",
    "sublayers_of": "circuits.lens.capture",
    "CounterfactualSet": "circuits.lens.counterfactual",
    "counterfactual_rows": "circuits.lens.counterfactual",
    "counterfactual_set": "circuits.lens.counterfactual",
    "parse_operands": "circuits.lens.counterfactual",
    "decode_states": "circuits.lens.decode",
    "early_decode": "circuits.lens.decode",
    "PromptGroup": "circuits.lens.inputs",
    "answer_token_id": "circuits.lens.inputs",
    "prompt_groups": "circuits.lens.inputs",
    "InterchangeResult": "circuits.lens.interchange_check",
    "interchange": "circuits.lens.interchange_check",
    "OPERATOR_TEXTS": "circuits.lens.numeric",
    "NumericTable": "circuits.lens.numeric",
    "numeric_table": "circuits.lens.numeric",
    "METRICS": "circuits.lens.result",
    "LensResult": "circuits.lens.result",
    "json_ready": "circuits.lens.result",
})
