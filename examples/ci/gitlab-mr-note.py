#!/usr/bin/env python3
"""Post a Markdown report (drift-report.sh's) as a note on the merge request of this GitLab pipeline.

    gitlab-mr-note.py REPORT

GitLab's job token (CI_JOB_TOKEN) may not write merge request notes, so the note is posted with a
project access token (role Reporter, scope api) kept in a masked CI/CD variable, KL_GITLAB_TOKEN.
GitLab sets the rest: CI_API_V4_URL, CI_PROJECT_ID, CI_MERGE_REQUEST_IID (merge request
pipelines only: in any other pipeline nothing is posted). Exit 0 when posted or when there is no
merge request, 1 (with one line saying why) when the note could not be posted.
Standard library only: it runs in any image with python3, as kl.pyz does.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

NOTE_LIMIT = 1_000_000  # GitLab refuses a longer note body


def fail(message: str) -> int:
    print(f"gitlab-mr-note: {message}", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        return fail("usage: gitlab-mr-note.py REPORT")
    mr = os.environ.get("CI_MERGE_REQUEST_IID")
    if not mr:
        print("gitlab-mr-note: not a merge request pipeline (no CI_MERGE_REQUEST_IID); nothing posted")
        return 0
    missing = [v for v in ("CI_API_V4_URL", "CI_PROJECT_ID", "KL_GITLAB_TOKEN") if not os.environ.get(v)]
    if missing:
        return fail(f"{', '.join(missing)} not set (KL_GITLAB_TOKEN: a project access token with the api scope)")
    try:
        with open(argv[0], encoding="utf-8") as fh:
            body = fh.read()
    except OSError as exc:
        return fail(f"{argv[0]}: {exc.strerror or exc}")
    if not body.strip():
        return fail(f"{argv[0]} is empty: the drift check wrote no report")
    if len(body) > NOTE_LIMIT:
        cut = "\n\n… (cut: the whole report is the job's kl-drift.md artifact)\n"
        body = body[: NOTE_LIMIT - len(cut)] + cut
    project = urllib.parse.quote(os.environ["CI_PROJECT_ID"], safe="")
    url = f"{os.environ['CI_API_V4_URL'].rstrip('/')}/projects/{project}/merge_requests/{mr}/notes"
    request = urllib.request.Request(url, data=json.dumps({"body": body}).encode(), method="POST", headers={
        "PRIVATE-TOKEN": os.environ["KL_GITLAB_TOKEN"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            note = json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return fail(f"GitLab answered {exc.code} {exc.reason} to POST {url}")
    except (urllib.error.URLError, OSError) as exc:
        return fail(f"cannot reach GitLab at {url}: {getattr(exc, 'reason', exc)}")
    print(f"gitlab-mr-note: posted note {note.get('id', '?')} on merge request !{mr}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
