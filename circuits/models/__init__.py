"""Models: what to load and how, and what it will cost.

* :mod:`.spec`: :class:`~circuits.models.spec.ModelSpec` (a name, backend, dtype, placement);
* :mod:`.loading`: ``load_model`` (zoo names, pretrained names, local folders, GGUF files), which asks
  :mod:`.loaders` (the registry of how each backend builds a model) and never a backend's name;
* :mod:`.names` and :mod:`.hub`: what a name is, checked before anything heavy is imported (no network);
* :mod:`.local`, :mod:`.gguf`: local Hugging Face folders; GGUF files converted once into a cached folder;
* :mod:`.placement`, :mod:`.memory`: ``--device-map``/``--max-memory``; the memory estimate, ``--batch-size auto``
  and out-of-memory halving.

May import: :mod:`circuits.tasks` (a memory estimate needs prompt lengths), :mod:`circuits.zoo`, the package root's
errors, vocabulary, validation and logs, and :mod:`interventions`; not prompts, store, the runner or the analyses.
"""
