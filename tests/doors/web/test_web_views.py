"""The panel people would rather look at (docs/web.md "Previews, diffs, logs, layout"), in
Debian's Chromium: previews of committed snapshots (W2) through the scoped API (an image is an
image, a CSV a table), the changed lines of two snapshots, terminal output with its colours
and its ``\\r`` progress lines as a terminal shows them, every action of an execution row
inside the viewport at 1280 and 390 px, axe-core with no serious or critical violation on
every view (light and dark), every action reachable with the keyboard."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect
from web_helpers import Served, new_session, pdf, png, run, upload

pytest_plugins = ["web_fixtures"]

#: Node packages for the tests (as tests/doors/mcp/test_mcp_inspector.py installs them).
NODE_DIR = Path(os.environ.get("SHELLYARD_TEST_NODE_DIR", Path.home() / ".cache/shellyard-node"))
AXE = NODE_DIR / "node_modules" / "axe-core" / "axe.min.js"

LONG_COMMAND = "echo " + "a-rather-long-argument " * 12 + "&& true"


@pytest.fixture(scope="module")
def axe_source() -> str:
    if not AXE.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: axe-core comes from npm")
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "axe-core"],
            cwd=NODE_DIR,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return AXE.read_text()


def scene(served: Served) -> dict[str, Any]:
    """A session with a plot, a CSV, an SVG that tries to script, an HTML file, a text file
    changed between two snapshots, coloured output and a long command."""
    session = new_session(served)
    agent = session["main_agent_id"]
    first = run(served, agent, "printf 'alpha\\nbeta\\nsame\\n' > notes.txt")
    upload(served, agent, "plot.png", png(40, 24))
    upload(served, agent, "table.csv", b'name,score\n"Ada, L.",3\nBob,5\n')
    svg = (
        b'<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20">'
        b"<script>parent.document.title='pwned'</script>"
        b'<rect width="20" height="20" fill="green"/></svg>'
    )
    upload(served, agent, "icon.svg", svg)
    upload(
        served,
        agent,
        "README.md",
        b"# Title\n\nSome **bold** and `code`.\n\n- one\n- two\n\n"
        b"<script>document.title='x'</script>\n",
    )
    upload(served, agent, "page.html", b"<script>parent.document.title='pwned'</script>")
    upload(
        served,
        agent,
        "analysis.py",
        b"import math\n\n\ndef area(r):\n    # the circle's\n"
        b'    return math.pi * r ** 2  # "<img src=x onerror=alert(1)>"\n',
    )
    upload(served, agent, "figure.pdf", pdf(3))
    upload(served, agent, "broken.pdf", b"%PDF-1.4\nnot really a PDF\n")
    lines = b"".join(b"line %06d of a long log\n" % n for n in range(6000))
    upload(served, agent, "long.log", lines + b"THE-LAST-LINE\n")
    second = run(served, agent, "printf 'alpha\\ngamma\\nsame\\n' > notes.txt")
    colour = run(
        served,
        agent,
        "printf '\\033[31mred words\\033[0m plain words\\n10%%\\r50%%\\r100%% done\\n'",
    )
    long = run(served, agent, LONG_COMMAND)
    return {
        "session": session["session_id"],
        "agent": agent,
        "first": first["snapshot_seq"],
        "second": second["snapshot_seq"],
        "colour": colour["execution_id"],
        "long": long["execution_id"],
        "workspace": colour["workspace_id"],
    }


@pytest.fixture(scope="module")
def ids(served: Served) -> dict[str, Any]:
    return scene(served)


async def axe_check(page: Page, source: str, where: str) -> None:
    """axe-core's WCAG 2 A/AA rules on the page as it is: no serious or critical violation."""
    if not await page.evaluate("() => typeof window.axe !== 'undefined'"):
        # Through the devtools protocol: the page's CSP (no inline script) stays as it is.
        await page.evaluate(source + "\n;typeof window.axe")
    found = await page.evaluate(
        """async () => {
            const r = await axe.run(document, {runOnly: {type: 'tag',
              values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}});
            return r.violations.filter(v => ['serious', 'critical'].includes(v.impact))
              .map(v => ({id: v.id, impact: v.impact,
                          nodes: v.nodes.slice(0, 5)
                            .map(n => n.target.join(' ') + ': ' + n.failureSummary)}));
        }"""
    )
    assert found == [], f"{where}: {found}"


async def open_panel(page: Page, served: Served, ids: dict[str, Any]) -> None:
    await page.goto(served.login_url(ids["session"]))
    await expect(page.locator(f'tr[data-execution="{ids["long"]}"]')).to_be_visible()
    await expect(page.locator("#file-table")).to_contain_text("plot.png")


async def test_a_plot_is_shown_as_an_image(served: Served, ids: dict[str, Any], page: Page) -> None:
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview plot.png").click()
    image = page.locator("#preview-image")
    await expect(image).to_be_visible()
    await page.wait_for_function(
        "() => document.getElementById('preview-image').complete && "
        "document.getElementById('preview-image').naturalWidth > 0"
    )
    assert await image.evaluate("img => img.naturalWidth") == 40


async def test_previews_never_run_a_workspace_file_as_script(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    """An SVG is served as an image with a sandboxing policy and shown by <img> (no script);
    an HTML file is an attachment, never a page of the panel's origin."""
    base = f"/v1/sessions/{ids['session']}/files/preview"
    with served.admin() as client:
        svg = client.get(base, params={"workspace_id": ids["workspace"], "path": "icon.svg"})
        html = client.get(base, params={"workspace_id": ids["workspace"], "path": "page.html"})
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert "sandbox" in svg.headers["content-security-policy"]
    assert "default-src 'none'" in svg.headers["content-security-policy"]
    assert svg.headers["x-content-type-options"] == "nosniff"
    assert html.headers["content-type"] == "application/octet-stream"
    assert html.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in html.headers["content-security-policy"]
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview icon.svg").click()
    await page.wait_for_function(
        "() => document.getElementById('preview-image')?.naturalWidth === 20"
    )
    assert await page.title() == "shellyard"
    # Another session's reach: the preview route answers like a missing object.
    other = new_session(served)
    with served.admin() as client:
        token = client.post(
            "/v1/tokens", json={"kind": "session", "session_id": other["session_id"]}
        )
    assert token.status_code == 200, token.text
    answer = httpx.get(
        f"{served.url}{base}",
        params={"workspace_id": ids["workspace"], "path": "plot.png"},
        headers={"Authorization": f"Bearer {token.json()['token']}"},
    )
    assert answer.status_code == 404, answer.text


async def test_a_csv_is_a_table(served: Served, ids: dict[str, Any], page: Page) -> None:
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview table.csv").click()
    table = page.locator("#csv-table")
    await expect(table.locator("thead th")).to_have_text(["name", "score"])
    await expect(table.locator("tbody tr").first.locator("td")).to_have_text(["Ada, L.", "3"])
    await expect(page.locator("#csv-count")).to_contain_text("2 rows")


async def test_code_is_shown_in_colour(served: Served, ids: dict[str, Any], page: Page) -> None:
    """A Python file's keywords and comments are coloured (highlight.js by the file's ending),
    in colours other than plain text; markup in its text stays text."""
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview analysis.py").click()
    code = page.locator("#preview-text code.hljs")
    await expect(code.locator(".hljs-keyword").first).to_have_text("import")
    await expect(code.locator(".hljs-comment").first).to_contain_text("the circle's")
    colours = await code.evaluate(
        """c => [getComputedStyle(c).color,
                 getComputedStyle(c.querySelector('.hljs-keyword')).color,
                 getComputedStyle(c.querySelector('.hljs-comment')).color]"""
    )
    assert len(set(colours)) == 3, colours
    await expect(code).to_contain_text('"<img src=x onerror=alert(1)>"')
    assert await page.locator("#preview img").count() == 0


async def test_a_pdf_shows_its_first_page_in_a_sandboxed_frame(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    """A PDF's first page is drawn (dark pixels of its square on the canvas) by PDF.js in a
    frame whose origin is opaque: it can read neither the panel, nor the login cookie, nor the
    API with it. A file that is not a PDF says so."""
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview figure.pdf").click()
    await expect(page.locator("#preview-pdf-note")).to_have_text(
        "Page 1 of 3; the download link has the whole file.", timeout=30_000
    )
    frame = page.frame_locator("#preview-pdf")
    dark = await frame.locator("canvas").evaluate(
        """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                  let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] < 40) n++;
                  return [c.width, n]; }"""
    )
    assert dark[0] > 0 and dark[1] > 1000, dark
    reach = await frame.locator("canvas").evaluate(
        """async () => {
            const tried = {};
            try { tried.cookie = document.cookie; } catch (e) { tried.cookie = 'denied'; }
            try { tried.parent = parent.document.title; } catch (e) { tried.parent = 'denied'; }
            try { tried.api = (await fetch('/v1/sessions', {credentials: 'include'})).status; }
            catch (e) { tried.api = 'denied'; }
            return tried;
        }"""
    )
    assert reach["cookie"] == "denied" and reach["parent"] == "denied", reach
    assert reach["api"] in ("denied", 401), reach
    await page.get_by_role("button", name="Preview broken.pdf").click()
    await expect(page.locator("#preview-pdf-note")).to_contain_text("Not shown", timeout=30_000)


async def test_a_large_file_is_read_by_ranges(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    """A 150 KB log: the first 64 KiB, then the next ranges on demand from the same snapshot,
    until the last line shows and the button goes."""
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview long.log").click()
    text = page.locator("#preview-text")
    await expect(page.locator("#preview-shown")).to_contain_text("First 64.0 KiB of")
    await expect(text).to_contain_text("line 000000 of a long log")
    await expect(text).not_to_contain_text("THE-LAST-LINE")
    more = page.locator("#preview-more")
    await more.click()
    await expect(page.locator("#preview-shown")).to_contain_text("First 128.0 KiB of")
    await more.click()
    await expect(text).to_contain_text("THE-LAST-LINE")
    await expect(page.locator("#preview-shown")).to_contain_text("All ")
    await expect(more).to_be_hidden()
    # Each line once: the ranges joined without a gap or an overlap.
    shown = await text.text_content()
    assert shown is not None and shown.count("line 002900 of a long log") == 1
    assert shown.count("\n") == 6001


async def test_markdown_is_rendered_safely(served: Served, ids: dict[str, Any], page: Page) -> None:
    await open_panel(page, served, ids)
    await page.get_by_role("button", name="Preview README.md").click()
    shown = page.locator("#preview .markdown")
    await expect(shown.locator("h5")).to_have_text("Title")
    await expect(shown.locator("strong")).to_have_text("bold")
    await expect(shown.locator("li")).to_have_text(["one", "two"])
    # Raw HTML is text: visible as written, never an element.
    await expect(shown).to_contain_text("<script>document.title='x'</script>")
    assert await shown.locator("script").count() == 0
    assert await page.title() == "shellyard"


async def test_the_diff_shows_the_removed_and_the_added_line(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    await open_panel(page, served, ids)
    await page.get_by_label("From snapshot").select_option(str(ids["first"]))
    await page.get_by_label("To snapshot").select_option(str(ids["second"]))
    await page.get_by_role("button", name="Show diff").click()
    change = page.locator("#diff-result .change-changed", has_text="notes.txt")
    await expect(change.locator("tr.line-removed td.code")).to_have_text(["beta"])
    await expect(change.locator("tr.line-added td.code")).to_have_text(["gamma"])
    await expect(change.locator("tr.line-same td.code").first).to_have_text("alpha")
    # The changed words are marked (the whole line here: one word).
    await expect(change.locator("del")).to_have_text("beta")
    await expect(change.locator("ins")).to_have_text("gamma")
    # The added image is shown as an image.
    added = page.locator("#diff-result .change-added", has_text="plot.png")
    await expect(added.locator("img")).to_be_visible()


async def test_coloured_output_and_progress_lines(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    await open_panel(page, served, ids)
    await page.get_by_role("button", name=f"View logs of {ids['colour']}").click()
    out = page.locator("#log-stdout")
    await expect(out).to_contain_text("plain words")
    text = await out.inner_text()
    assert "\x1b" not in text and "[31m" not in text and "[0m" not in text, repr(text)
    # \r: what the terminal shows is the last drawing of the line.
    assert "100% done" in text and "10%" not in text.replace("100%", ""), repr(text)
    red = out.locator("span", has_text="red words")
    colours = await out.evaluate(
        """pre => {
            const red = [...pre.querySelectorAll('span')].find(s => s.textContent === 'red words');
            return [getComputedStyle(red).color, getComputedStyle(pre).color];
        }"""
    )
    assert colours[0] != colours[1], colours
    await expect(red).to_have_count(1)
    # The log view is directly under its execution's row.
    below = await page.evaluate(
        f"""() => document.querySelector('tr[data-execution="{ids["colour"]}"]')
            .nextElementSibling.contains(document.getElementById('log-view'))"""
    )
    assert below
    # Search marks the matches; the whole log is a download.
    await page.get_by_label("Find in log").fill("words")
    await expect(out.locator("mark")).to_have_count(2)
    async with page.expect_download() as caught:
        await page.get_by_role("link", name=f"Download stdout of {ids['colour']}").click()
    saved = await (await caught.value).path()
    assert Path(saved).read_bytes().startswith(b"\x1b[31mred words\x1b[0m plain words\n")


async def test_the_converters(served: Served, ids: dict[str, Any], page: Page) -> None:
    """The page's ANSI converter and line diff, as the browser runs them."""
    await open_panel(page, served, ids)
    found = await page.evaluate(
        """async () => {
            const {renderAnsi} = await import('/ui/static/ansi.js');
            const {diffLines, parseDelimited} = await import('/ui/static/textdiff.js');
            const pre = document.createElement('pre');
            renderAnsi(pre, '\\u001b[1;38;5;196mA\\u001b[22;39mB' +
                            '\\u001b]0;title\\u0007C abc\\rX\\u001b[K\\n');
            // an escape split across two writes waits for its end
            const split = document.createElement('pre');
            const t = renderAnsi(split, 'x\\u001b[3');
            t.write('2my\\n');
            return {
              text: pre.textContent, bold: pre.querySelector('.ansi-bold')?.textContent,
              colour: pre.querySelector('.ansi-bold')?.style.color,
              split: split.textContent, green: split.querySelector('.ansi-fg-2')?.textContent,
              diff: diffLines(['a', 'b'], ['b', 'c']).map(o => o.op + o.text).join(' '),
              csv: parseDelimited('a\\tb\\n1\\t2', '\\t').rows,
            };
        }"""
    )
    assert found["text"] == "X\n", found  # \r then erase-to-end: only X is left
    assert found["split"] == "xy\n" and found["green"] == "y", found
    assert found["diff"] == "-a =b +c", found
    assert found["csv"] == [["a", "b"], ["1", "2"]], found


@pytest.mark.parametrize("size", [(1280, 800), (390, 800)])
async def test_every_action_of_a_row_is_in_the_viewport(
    served: Served, ids: dict[str, Any], browser: Browser, size: tuple[int, int]
) -> None:
    running = run(served, ids["agent"], "sleep 30", background=True)
    context = await browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = await context.new_page()
    try:
        await open_panel(page, served, ids)
        row = page.locator(f'tr[data-execution="{running["execution_id"]}"]')
        await expect(row.get_by_role("button", name="Cancel execution")).to_be_visible()
        for button in await row.locator("button").all():
            if not await button.is_visible():
                continue
            box = await button.bounding_box()
            assert box is not None
            assert box["x"] >= 0 and box["x"] + box["width"] <= size[0], (size, box)
        # Nothing scrolls sideways: neither the page nor the table's box.
        widths = await page.evaluate(
            """() => [document.documentElement.scrollWidth - innerWidth,
                      ...[...document.querySelectorAll('.scroll')]
                        .filter(b => b.querySelector('#execution-table'))
                        .map(b => b.scrollWidth - b.clientWidth)]"""
        )
        assert all(w <= 0 for w in widths), widths
        # The long command is one line; its whole text on demand.
        long_row = page.locator(f'tr[data-execution="{ids["long"]}"]')
        command = long_row.locator("code.command")
        height = await command.evaluate("c => c.getBoundingClientRect().height")
        line = await command.evaluate("c => parseFloat(getComputedStyle(c).lineHeight) || 20")
        assert height <= line * 1.5, (height, line)
        await long_row.get_by_role("button", name=f"Full command of {ids['long']}").click()
        await expect(long_row.locator("pre.command-full")).to_have_text(LONG_COMMAND)
    finally:
        await context.close()
        served.call("POST", f"/v1/executions/{running['execution_id']}/cancel", ids["agent"])


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_axe_finds_no_serious_violation(
    served: Served, ids: dict[str, Any], browser: Browser, axe_source: str, scheme: str
) -> None:
    context = await browser.new_context(
        viewport={"width": 1280, "height": 800},
        color_scheme=scheme,  # type: ignore[arg-type]
    )
    page = await context.new_page()
    try:
        await page.goto(f"{served.url}/ui/")
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} login")
        await page.goto(served.login_url())
        await expect(page.locator("#session-list button").first).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} sessions list")
        # a second login link while logged in asks first (docs/web.md): the question is a
        # view of its own, checked too, then the link is used
        await page.goto(served.login_url(ids["session"]))
        await expect(page.get_by_role("heading", name="Use this login link?")).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} login link question")
        await page.get_by_role("button", name="Use the link").click()
        await expect(page.locator(f'tr[data-execution="{ids["long"]}"]')).to_be_visible()
        await expect(page.locator("#file-table")).to_contain_text("plot.png")
        await axe_check(page, axe_source, f"{scheme} panel")
        await page.get_by_role("button", name=f"View logs of {ids['colour']}").click()
        await expect(page.locator("#log-stdout")).to_contain_text("plain words")
        await axe_check(page, axe_source, f"{scheme} log view")
        await page.get_by_role("button", name="Preview table.csv").click()
        await expect(page.locator("#csv-table")).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} CSV preview")
        await page.get_by_role("button", name="Preview analysis.py").click()
        await expect(page.locator("#preview-text code.hljs")).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} code preview")
        await page.get_by_role("button", name="Preview figure.pdf").click()
        await expect(page.locator("#preview-pdf-note")).to_contain_text("Page 1 of 3")
        await axe_check(page, axe_source, f"{scheme} PDF preview")
        await page.get_by_role("button", name="Preview plot.png").click()
        await expect(page.locator("#preview-image")).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} image preview")
        await page.get_by_label("From snapshot").select_option(str(ids["first"]))
        await page.get_by_label("To snapshot").select_option(str(ids["second"]))
        await page.get_by_role("button", name="Show diff").click()
        await expect(page.locator("#diff-result tr.line-added").first).to_be_visible()
        await axe_check(page, axe_source, f"{scheme} diff")
    finally:
        await context.close()


async def test_every_action_is_reachable_with_the_keyboard(
    served: Served, ids: dict[str, Any], page: Page
) -> None:
    """Tab visits every visible button, link, field and scroll box of the panel, and Enter on
    View logs opens the log view, whose controls Tab reaches too."""
    await open_panel(page, served, ids)
    await page.get_by_role("button", name=f"View logs of {ids['colour']}").focus()
    await page.keyboard.press("Enter")
    await expect(page.locator("#log-stdout")).to_contain_text("plain words")
    await page.locator("body").focus()
    await page.evaluate("() => document.activeElement.blur()")
    wanted = await page.evaluate(
        """() => [...document.querySelectorAll('button, a[href], input, select, [tabindex="0"]')]
            .filter(el => el.offsetParent !== null && !el.disabled).length"""
    )
    seen = 0
    for _ in range(wanted * 2 + 20):
        await page.keyboard.press("Tab")
        seen = await page.evaluate(
            """() => {
                window.__seen = window.__seen || new Set();
                const el = document.activeElement;
                if (el && el.matches('button, a[href], input, select, [tabindex="0"]')) {
                    window.__seen.add(el);
                }
                return window.__seen.size;
            }"""
        )
        if seen >= wanted:
            break
    missing = await page.evaluate(
        """() => [...document.querySelectorAll('button, a[href], input, select, [tabindex="0"]')]
            .filter(el => el.offsetParent !== null && !el.disabled && !window.__seen.has(el))
            .map(el => el.getAttribute('aria-label') || el.textContent.trim() || el.id)"""
    )
    assert missing == [], missing
    # The full command, with the keyboard.
    toggle = page.get_by_role("button", name=f"Full command of {ids['long']}")
    await toggle.focus()
    await page.keyboard.press("Enter")
    await expect(toggle).to_have_attribute("aria-expanded", "true")
