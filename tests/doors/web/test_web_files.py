"""Issue 14 item 2, W2/W5/T5: the session file panel shows the head snapshot's files
(folders, a text preview, downloads of a file and of a folder as tar), the snapshot picker
(history with what made each snapshot), the diff of two snapshots, and artifacts; it follows
the head live. Real Chromium."""

from __future__ import annotations

import tarfile
from pathlib import Path

from playwright.async_api import Page, expect
from web_helpers import Served, new_session, run

pytest_plugins = ["web_fixtures"]


async def test_browse_preview_download_history_diff_artifacts(
    served: Served, page: Page, tmp_path: Path
) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    first = run(
        served,
        agent,
        "mkdir -p src/pkg && printf 'v1\\n' > notes.txt && "
        "printf 'print(42)\\n' > src/pkg/main.py && printf '\\x00\\x01' > blob.bin",
    )
    second = run(served, agent, "printf 'v2\\n' > notes.txt && rm blob.bin && echo new > added.md")
    served.call("POST", "/v1/artifacts", agent, json={"path": "src/pkg/main.py", "name": "entry"})
    await page.goto(served.login_url(session["session_id"]))
    table = page.locator("#file-table")
    await expect(table).to_contain_text("notes.txt")
    await expect(table).to_contain_text("added.md")
    await expect(table).not_to_contain_text("blob.bin")

    # Folders open; a file's preview shows its text.
    await page.get_by_role("button", name="Open folder src").click()
    await page.get_by_role("button", name="Open folder pkg").click()
    await expect(page.get_by_label("Folder path")).to_contain_text("pkg")
    await page.get_by_role("button", name="Preview main.py").click()
    await expect(page.locator("#preview pre")).to_have_text("print(42)\n")

    # Download of a file and of a folder (tar) through plain links.
    async with page.expect_download() as caught:
        await page.get_by_role("link", name="Download main.py").click()
    download = await caught.value
    assert download.suggested_filename == "main.py"
    saved = tmp_path / "main.py"
    await download.save_as(saved)
    assert saved.read_text() == "print(42)\n"
    await page.get_by_role("button", name="Workspace root").click()
    async with page.expect_download() as caught:
        await page.get_by_role("link", name="Download folder src as tar").click()
    tar_download = await caught.value
    tar_path = tmp_path / "src.tar"
    await tar_download.save_as(tar_path)
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        member = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("main.py")))
        assert member is not None and member.read() == b"print(42)\n"
    assert any(n.endswith("pkg/main.py") for n in names), names

    # The snapshot picker: history with what made each snapshot; an older one shows old files.
    picker = page.get_by_label("Snapshot", exact=True)
    options = await picker.locator("option").all_inner_texts()
    assert any(f"execution {first['execution_id']}" in o for o in options), options
    assert any(f"execution {second['execution_id']}" in o and "(head)" in o for o in options)
    await picker.select_option(str(first["snapshot_seq"]))
    await expect(table).to_contain_text("blob.bin")
    await page.get_by_role("button", name="Preview notes.txt").click()
    await expect(page.locator("#preview pre")).to_have_text("v1\n")
    await page.get_by_role("button", name="Preview blob.bin").click()
    await expect(page.locator("#preview")).to_contain_text("Not text")

    # The diff of two snapshots.
    await page.get_by_label("From snapshot").select_option(str(first["snapshot_seq"]))
    await page.get_by_label("To snapshot").select_option(str(second["snapshot_seq"]))
    await page.get_by_role("button", name="Show diff").click()
    diff = page.locator("#diff-result")
    await expect(diff).to_contain_text("Changes from")
    assert "added added.md" in " ".join((await diff.inner_text()).split())
    await expect(diff.locator(".change-removed")).to_contain_text("blob.bin")
    await expect(diff.locator(".change-changed")).to_contain_text("notes.txt")

    # Artifacts: listed and downloadable.
    async with page.expect_download() as caught:
        await page.get_by_role("link", name="Download artifact entry").click()
    artifact = await caught.value
    artifact_path = tmp_path / "entry"
    await artifact.save_as(artifact_path)
    assert artifact_path.read_bytes() == b"print(42)\n"

    # Following the head: a new snapshot shows without a reload.
    await picker.select_option("")
    run(served, agent, "echo later > later.txt")
    await expect(table).to_contain_text("later.txt", timeout=2000)


def test_downloads_refuse_a_workspace_outside_the_session(served: Served) -> None:
    """Session-scoped reads stay inside the session (another session's workspace is 404) and
    paths stay inside the workspace (W6)."""
    import httpx

    mine = new_session(served)
    other = new_session(served)
    run(served, other["main_agent_id"], "echo secret > s.txt")
    [theirs] = [
        w
        for w in served.call("GET", "/v1/workspaces", other["main_agent_id"])
        if w["relation"] == "own"
    ]
    with served.admin() as client:
        response = client.get(
            f"/v1/sessions/{mine['session_id']}/files/content",
            params={"workspace_id": theirs["workspace_id"], "path": "s.txt"},
        )
        assert response.status_code == 404, response.text
        assert "no workspace" in response.json()["error"]["message"]
        ok = client.get(
            f"/v1/sessions/{other['session_id']}/files/content",
            params={"workspace_id": theirs["workspace_id"], "path": "s.txt"},
        )
        assert ok.status_code == 200 and ok.content == b"secret\n"
        assert ok.headers["content-disposition"].startswith('attachment; filename="s.txt"')
        escape = client.get(
            f"/v1/sessions/{other['session_id']}/files/content",
            params={"workspace_id": theirs["workspace_id"], "path": "../../etc/passwd"},
        )
        assert escape.status_code == 400, escape.text
    assert (
        httpx.get(f"{served.url}/v1/sessions/{other['session_id']}/workspaces").status_code == 401
    )
