"""The application layer of adaptive-draft: everything that trains, judges and reports, over the decoding
library (``adaptive``), the environments (``envs``) and the policies (``policies``) — the only package that
imports all three. The ``adaptive`` console command is :mod:`lab.cli`."""
