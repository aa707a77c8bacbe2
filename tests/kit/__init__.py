"""The test kit: helper code shared by the test suites, the benches and the chaos runner.

pyproject.toml puts tests/ on pytest's `pythonpath`, so every test and bench imports it as
`from kit.<module> import ...`; the chaos runner runs as `python -m kit.chaos` with tests/ on
PYTHONPATH (scripts/chaos.sh). Fixtures stay in the conftest.py files (pytest finds them there
only); what they do lives here.

- paths: the repository, the test cache (real providers, Terraform) and the fake provider
- procs: the process table (the one /proc scan for leftover providers), child signal dispositions
- pg: the PostgreSQL server and per-test databases
- kl: running `python -m kilolock` as a user would
- states, faults: states for tests; the fault-injecting fake provider installed as a plugin
- invariants: what must hold in the database after any fault
- providers, tfworkspace, tfcli, pyz: real provider binaries, Terraform workspaces, Terraform and
  OpenTofu against kl serve, kl.pyz builds
- codec: the two codec backends (tests/codec, the codec bench)
- httpclient, loadgen, fuzz, fuzzhttp, leaks, state_diff: per-suite helpers
- chaos: the chaos runner behind scripts/chaos.sh
"""
