"""Position-aware edge attribution (EAP, EAP-IG) and edge-patching circuits: the graph (``graph``), one pass
over it (``engine``), scores (``scores``), circuits and their faithfulness (``circuits``), the analysis
(``analysis``), its config and result, and the MIB export. Imports ``interventions`` and the shared modules
of ``circuits`` below the analyses; nothing here imports a command."""
