"""Real Terraform workspaces for the end-to-end refresh, pyz and secrets tests and the chaos runner.

A session-scoped workspace is applied once by Terraform 1.0.3 with five real providers
(null, local, random, time: protocol 5; Terraform's provider-simple-v6: protocol 6); each test
gets its own copy, since out-of-band changes edit its files.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kit.paths import CACHE, LOCAL_V, RANDOM_V, TERRAFORM

MAIN_TF = f"""
terraform {{
  required_providers {{
    null   = {{ source = "hashicorp/null", version = "2.1.2" }}
    local  = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
    random = {{ source = "hashicorp/random", version = "{RANDOM_V}" }}
    time   = {{ source = "hashicorp/time", version = "0.14.2" }}
    simple = {{ source = "hashicorp/simple", version = "1.5.7" }}
  }}
}}
resource "null_resource" "n" {{
  count    = 3
  triggers = {{ index = count.index, note = "a<b & c" }}
}}
resource "local_file" "f" {{
  for_each = toset(["one", "two", "three", "four"])
  filename = "${{path.module}}/out/${{each.key}}.txt"
  content  = "hello ${{each.key}}"
}}
resource "random_password" "p" {{ length = 16 }}
resource "time_static" "t" {{}}
resource "simple_resource" "s" {{ value = "v" }}
"""


def terraform_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(TF_CLI_CONFIG_FILE=str(CACHE / "terraformrc"), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    return env


def terraform(ws: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(TERRAFORM), *args, "-input=false", "-no-color"], cwd=ws, env=terraform_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"terraform {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r
