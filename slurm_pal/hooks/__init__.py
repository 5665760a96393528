"""Prolog/Epilog hooks: what a job really got on a node, handed to the advisor (PROTOCOL.md,
op ``record``).

Stdlib only, and nothing here may import numpy or pandas: slurmd waits for the Prolog before
the job starts, so a hook must finish well under a second (``tests/test_hooks.py`` checks the
imports). The rendered Prolog/Epilog scripts call ``python -m slurm_pal.hooks prolog|epilog``
directly; ``slurm-pal hook`` offers the same commands for admins.

A hook never fails a job: it exits 0 whatever happens, under a hard time limit. A record is
first written atomically into the spool dir, then offered to the advisor: its Unix socket, or
on a compute node (``--advisor HOST:PORT``) its TCP listener, the record inside a munge
credential of the node's munged; the file is deleted once the advisor answers ok, else the
service's sweep (a shared spool dir) or ``hook flush`` (fresh credentials) delivers it.
"""
