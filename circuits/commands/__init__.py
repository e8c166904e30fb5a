"""Commands: one module per ``af1`` command (``add_arguments``, the checks made before anything loads, ``run``) and
:mod:`.common`, the one place the flags become specs (a :class:`~circuits.models.spec.ModelSpec`, a
:class:`~circuits.prompts.spec.PromptSpec`, the output directory) and their checks.

May import everything below it; nothing imports it but :mod:`circuits.cli`. No ``argparse.Namespace`` travels past
a command module.
"""
