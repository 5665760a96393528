"""The advisor engine: every decision the advisor makes, pure and clock-injected, built once
from the site's settings (:class:`~slurm_pal.engine.engine.AdvisorEngine` from
:class:`~slurm_pal.engine.settings.EngineSettings`). Two drivers run it: the service
(``slurm_pal.advisor``, ``slurm-pal serve``) and the simulator's Slurm mode
(``slurm_pal.sim.engine``). It imports nothing of either, nor of ``adapters`` or ``cli``.

Nothing is imported here: the service's light paths (the hooks' client, ``serve health``)
import submodules of packages that must not pull numpy in.
"""
