"""Where things are: the repository, the test cache (real providers and Terraform, filled by
scripts/test-providers.sh and scripts/test-terraform.sh) and the fault-injecting fake provider."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KL_TEST_CACHE", Path.home() / ".cache" / "kilolock-test"))
PLUGIN_CACHE = CACHE / "plugin-cache"
TERRAFORM = CACHE / "bin" / "terraform-1.0.3"
# The peers of the benches, among the CLIs `scripts/test-terraform.sh all` builds into CACHE / "bin"
# (kit.clis.COMPILED and Terraform 1.0.3).
CLIS = ("terraform-1.0.3", "terraform-1.8.5", "terraform-1.12.2", "tofu-1.6.3", "tofu-1.8.5")
# The pseudo-versions of the provider builds scripts/test-providers.sh makes.
RANDOM_V = "1.3.2-0.20260824155315-e1092b0cfc07"
LOCAL_V = "1.4.1-0.20260513075820-3561e410f9fe"
# A script run as a plugin (a wrapper execs it): the provider suite tests it where it lives.
FAKE_PROVIDER = REPO / "tests" / "provider" / "fake_provider.py"
