"""The admin console, served by the gateway and driven in Debian's chromium: each operator view
against the real stack, stored XSS shown as text, the master key gone with the tab. Every
view's screenshot lands in .artifacts/console/ (README: "The admin console")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import expect

from tests.console.conftest import ADMIN, XSS_CONTENT, XSS_KEY_NAME, Console, Seeded, admin_client
from tests.support import Stack, call, create_api_key, mcp_session

# -- the shell and its assets (HTTP) -------------------------------------------------------------


async def test_shell_and_assets_need_no_key_and_carry_a_strict_csp(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, timeout=30) as http:
        shell = await http.get(stack.gateway_url + ADMIN)  # a base URL gains a "/" (the redirect below)
        assert shell.status_code == 200 and shell.headers["content-type"].startswith("text/html")
        csp = shell.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        # No inline script for the CSP to have to allow: every <script> loads a file.
        scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", shell.text, re.S)
        assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
        assert shell.headers["x-frame-options"] == "DENY"
        slash = await http.get(stack.gateway_url + ADMIN + "/")
        assert slash.status_code == 308 and slash.headers["location"] == ADMIN

        # Every module the entry point imports, transitively, is served (what the browser fetches).
        seen: set[str] = set()
        pending = ["admin.js"]
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            asset = await http.get(f"/assets/{name}")
            assert asset.status_code == 200, name
            assert asset.headers["content-type"].startswith("text/javascript")
            base = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
            for target in re.findall(r'from "\./([^"]+)"', asset.text):
                pending.append(base + target)
            for target in re.findall(r'from "\.\./([^"]+)"', asset.text):
                pending.append(target)
        assert {"admin.js", "lib/api.js", "lib/dom.js", "lib/force.js", "views/graph.js"} <= seen
        css = await http.get("/assets/admin.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")

        # Only the console's own files: no traversal, no other suffix, not the Python module.
        for probe in ("/assets/../console.py", "/assets/..%2fconsole.py", "/assets/%2e%2e/%2e%2e/keys.py", "/assets/index.html",
                      "/assets/nope.js", "/assets//etc/passwd", "/assets/views/../../console.py"):
            assert (await http.get(probe)).status_code == 404, probe
        # The data behind the shell still needs the master key.
        assert (await http.get("/keys")).status_code == 401


def test_the_console_offers_the_cycles_stages() -> None:
    """The maintenance view's stage list is the contract's (a stage added there shows up here)."""
    from shared.contract.maintenance import CONSOLIDATION_STAGES

    source = (Path(__file__).resolve().parents[2] / "services/gateway/admin/console/views/maintenance.js").read_text()
    listed = re.search(r"export const STAGES = \[(.*?)\];", source, re.S)
    assert listed is not None
    assert tuple(re.findall(r'"([a-z_]+)"', listed.group(1))) == CONSOLIDATION_STAGES


# -- the browser ---------------------------------------------------------------------------------


async def test_login_takes_only_the_master_key_and_keeps_it_for_the_tab(console: Console, stack: Stack, seeded: Seeded) -> None:
    page = console.page
    await console.login("not-the-master-key")
    await expect(page.locator("#login-error")).to_have_text("That is not the master key.")
    # A tenant's key, even with admin permission, is not the operator's.
    await console.login(seeded.raw_key)
    await expect(page.locator("#login-error")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0
    await console.shot("login")

    await console.login(stack.master_key)
    await expect(page.locator("nav.sidebar")).to_be_visible()
    assert await page.evaluate("Object.values(sessionStorage)") == [stack.master_key]
    # Never persisted beyond the tab: no localStorage, no cookie.
    assert await page.evaluate("localStorage.length") == 0
    assert await console.context.cookies() == []
    assert await page.evaluate("document.cookie") == ""

    # A new tab has its own sessionStorage: it starts at the login form.
    other = await console.context.new_page()
    await other.goto(console.url + "#/keys")
    await expect(other.locator("#login-form")).to_be_visible()
    assert await other.evaluate("sessionStorage.length") == 0
    await other.close()

    # Reloading the tab keeps the key (same tab); logging out forgets it.
    await page.reload()
    await expect(page.locator("nav.sidebar")).to_be_visible()
    await page.click("#logout")
    await expect(page.locator("#login-form")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0


async def test_a_closed_tab_takes_the_key_with_it(browser: Any, stack: Stack) -> None:
    """A browser context is a fresh profile: what a tab that closed leaves behind."""
    first = await browser.new_context()
    page = await first.new_page()
    await page.goto(stack.gateway_url + ADMIN)
    await page.fill("#master-key", stack.master_key)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("nav.sidebar")).to_be_visible()
    state = await first.storage_state()
    assert state["cookies"] == [] and all(not origin.get("localStorage") for origin in state["origins"])
    await first.close()
    second = await browser.new_context()
    page = await second.new_page()
    await page.goto(stack.gateway_url + ADMIN + "#/dashboard")
    await expect(page.locator("#login-form")).to_be_visible()
    await second.close()


async def test_dashboard_shows_the_stats_and_refreshes_them(logged_in: Console, stack: Stack, seeded: Seeded) -> None:
    page = logged_in.page
    await logged_in.open("dashboard")
    tile = page.locator('#stat-tiles [data-stat="fragments"] .tile-value')
    await expect(tile).to_be_visible()
    async with admin_client(stack) as http:
        stats = (await http.get("/stats")).json()
    shown = int((await tile.inner_text()).replace(",", ""))
    assert shown >= stats["fragments"] - 5  # other tests may write meanwhile; never fewer than were there
    for section in ("system", "queues", "search metrics", "observability"):
        await expect(page.locator(".card h3", has_text=re.compile(f"^{section}$", re.I))).to_have_count(1)
    await expect(page.locator("#stats .meter-row meter")).to_have_count(3)  # cpu, memory, disk
    await expect(page.locator("#health-flags")).to_be_visible()
    await expect(page.locator("#activity table tbody tr").first).to_be_visible()
    await logged_in.shot("dashboard")

    # Live: a fragment stored now shows up without a reload.
    raw, _ = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, raw) as s:
        await call(s, "remember", {
            "content": "The dashboard refresh check stores this one fragment.", "topic": "console-live", "type": "fact"})
    await expect(page.locator("#activity")).to_contain_text("The dashboard refresh check", timeout=20_000)
    assert int((await tile.inner_text()).replace(",", "")) > shown


async def test_keys_create_shows_the_raw_key_once_and_edits_it(logged_in: Console, stack: Stack) -> None:
    page = logged_in.page
    await logged_in.open("keys")
    await page.fill('#create-key input[name="name"]', "console-made-key")
    await page.select_option('#create-key select[name="default_mode"]', "recall-only")
    await page.fill('#create-key input[name="daily_limit"]', "500")
    await page.click("#create-key button[type=submit]")
    raw = (await page.locator("#raw-key").inner_text()).strip()
    assert raw.startswith("mmcp_")
    await logged_in.shot("keys-created")

    async with admin_client(stack) as http:
        made = [k for k in (await http.get("/keys")).json() if k["name"] == "console-made-key"]
    assert len(made) == 1 and made[0]["key_prefix"] == raw[:12] and made[0]["default_mode"] == "recall-only"
    assert made[0]["daily_limit"] == 500 and made[0]["permissions"] == ["read", "write"]
    key_id = made[0]["id"]
    # The raw key works (an MCP session opens with it) ...
    async with mcp_session(stack.mcp_url, raw) as s:
        assert "fragments" in await call(s, "recall", {"text": "anything at all"})
    # ... and is shown once: gone after leaving the view, and never stored by the console.
    await logged_in.open("dashboard")
    await logged_in.open("keys")
    await expect(page.locator("#keys-table")).to_contain_text("console-made-key")
    await expect(page.locator("#raw-key")).to_have_count(0)
    assert raw not in await page.content()
    assert raw not in await page.evaluate("JSON.stringify(sessionStorage) + JSON.stringify(localStorage)")

    # Edit it: default mode, workspace, daily limit, then deactivate.
    await page.locator("#keys-table tr", has_text="console-made-key").click()
    await page.select_option('#edit-mode select[name="default_mode"]', "audit")
    await page.click("#edit-mode button[type=submit]")
    await expect(page.locator("#keys-status")).to_contain_text("Default mode: saved.")
    await page.fill('#edit-workspace input[name="workspace"]', "console-ws")
    await page.click("#edit-workspace button[type=submit]")
    await expect(page.locator("#keys-status")).to_contain_text("Workspace: saved.")
    await page.fill('#edit-daily-limit input[name="daily_limit"]', "42")
    await page.click("#edit-daily-limit button[type=submit]")
    await expect(page.locator("#keys-status")).to_contain_text("Daily limit: saved.")
    await page.click("#toggle-status")
    await expect(page.locator("#key-status")).to_have_text("inactive")
    await logged_in.shot("keys-edited")
    async with admin_client(stack) as http:
        key = next(k for k in (await http.get("/keys")).json() if k["id"] == key_id)
    assert (key["default_mode"], key["default_workspace"], key["daily_limit"], key["status"]) == ("audit", "console-ws", 42, "inactive")


async def test_groups_and_members(logged_in: Console, stack: Stack, seeded: Seeded) -> None:
    page = logged_in.page
    await logged_in.open("keys")
    await page.fill('#create-group input[name="group_name"]', "console-group")
    await page.click("#create-group button[type=submit]")
    await page.locator("#groups tr", has_text="console-group").click()
    await page.select_option('#add-member select[name="key_id"]', seeded.key_id)
    await page.click("#add-member button[type=submit]")
    await expect(page.locator("#group-members")).to_contain_text(seeded.key_name)
    await logged_in.shot("groups")
    async with admin_client(stack) as http:
        group = next(g for g in (await http.get("/groups")).json() if g["name"] == "console-group")
        members = (await http.get(f"/groups/{group['id']}/members")).json()
    assert [m["id"] for m in members] == [seeded.key_id]


async def test_memory_browser_filters_pages_and_opens_a_fragment(logged_in: Console, seeded: Seeded) -> None:
    page = logged_in.page
    await logged_in.open("memory")
    await page.fill('#fragment-filters input[name="topic"]', seeded.topic)
    await page.select_option('#fragment-filters select[name="key_id"]', seeded.key_id)
    await page.click("#fragment-filters button[type=submit]")
    rows = page.locator("#fragments tbody tr")
    await expect(rows).to_have_count(3)
    for text in await rows.all_inner_texts():
        assert seeded.topic in text
    await expect(page.locator("#page-info")).to_contain_text("3 fragments")
    await logged_in.shot("memory")

    # type narrows further
    await page.select_option('#fragment-filters select[name="type"]', "error")
    await page.click("#fragment-filters button[type=submit]")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("502")

    # paging: two per page
    await logged_in.open(f"memory?topic={seeded.topic}&limit=2")
    await expect(rows).to_have_count(2)
    first_page = set(await rows.all_inner_texts())
    await page.click("#next-page")
    await expect(page.locator("#page-info")).to_contain_text("page 2 of 2")
    await expect(rows).to_have_count(1)
    assert not first_page & set(await rows.all_inner_texts())

    # open the error: its link to the fix
    await logged_in.open(f"memory?topic={seeded.topic}&type=error")
    await rows.first.click()
    await expect(page.locator("#fragment-content")).to_contain_text("502 because nginx pointed at port 8081")
    links = page.locator("#links tbody tr")
    await expect(links.filter(has_text="resolved_by")).to_have_count(1)
    await expect(links.filter(has_text="resolved_by")).to_contain_text("Pointing the nginx upstream")
    await logged_in.shot("fragment-links")

    # the amended decision: its earlier version
    await logged_in.open(f"fragment/{seeded.decision_id}")
    await expect(page.locator("#fragment-content")).to_have_text(seeded.decision_after)
    await expect(page.locator("#versions li")).to_have_count(1)
    await expect(page.locator("#versions")).to_contain_text(seeded.decision_before)
    await logged_in.shot("fragment-versions")


async def test_export_and_import_from_the_memory_browser(logged_in: Console, stack: Stack, seeded: Seeded, tmp_path: Path) -> None:
    page = logged_in.page
    await logged_in.open(f"memory?topic={seeded.topic}&key_id={seeded.key_id}")
    await expect(page.locator("#fragments tbody tr")).to_have_count(3)
    async with page.expect_download() as waiting:
        await page.click("#export")
    download = await waiting.value
    exported = tmp_path / "export.jsonl"
    await download.save_as(exported)
    lines = [json.loads(line) for line in exported.read_text().splitlines() if line.strip()]
    assert sorted(item["id"] for item in lines) == sorted([seeded.error_id, seeded.fix_id, seeded.decision_id])
    assert {item["topic"] for item in lines} == {seeded.topic}
    await expect(page.locator("#transfer-status")).to_contain_text("Exported 3 fragment(s).")

    # Import two fragments (no ids: new ones) into another key.
    _, target = await create_api_key(stack.database_url, name="console-import-target")
    source = tmp_path / "import.jsonl"
    source.write_text("\n".join(json.dumps({"content": c, "topic": "console-imported", "type": "fact"}) for c in (
        "Imported through the console: the build cache lives on the NVMe volume.",
        "Imported through the console: release tags are signed with the team key.",
    )))
    await logged_in.open("memory")
    await page.set_input_files('#import-form input[name="import_file"]', str(source))
    await page.select_option('#import-form select[name="import_key"]', target)
    await page.click("#import-form button[type=submit]")
    await expect(page.locator("#transfer-status")).to_contain_text("Imported 2 of 2")
    async with admin_client(stack) as http:
        stored = (await http.get("/memory/fragments", params={"key_id": target})).json()
    assert stored["total"] == 2 and {item["topic"] for item in stored["items"]} == {"console-imported"}


async def test_amend_and_forget_from_the_fragment_view(logged_in: Console, stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, raw) as s:
        stored = await call(s, "remember", {
            "content": "The staging cluster runs three gateway replicas.", "topic": "console-amend", "type": "fact"})
    page = logged_in.page
    await logged_in.open(f"fragment/{stored['id']}")
    await page.fill('#amend-form textarea[name="content"]', "The staging cluster runs four gateway replicas since the resize.")
    await page.click("#amend-form button[type=submit]")
    await expect(page.locator("#fragment-status")).to_contain_text("Amended.")
    await expect(page.locator("#fragment-content")).to_contain_text("four gateway replicas")
    await expect(page.locator("#versions")).to_contain_text("three gateway replicas")
    async with admin_client(stack) as http:
        detail = (await http.get(f"/memory/fragments/{stored['id']}")).json()
    assert "four gateway replicas" in detail["fragment"]["content"] and detail["fragment"]["key_id"] == key_id

    forget = page.get_by_role("button", name="Forget this fragment")
    await page.check('input[name="force"]')
    await forget.click()
    await page.get_by_role("button", name="Click again to forget").click()
    await expect(page.locator("#forgotten")).to_be_visible()
    async with admin_client(stack) as http:
        assert (await http.get(f"/memory/fragments/{stored['id']}")).status_code == 404


async def test_stored_xss_is_shown_as_text_everywhere(logged_in: Console, stack: Stack, seeded: Seeded) -> None:
    page = logged_in.page
    async with admin_client(stack) as http:
        response = await http.post("/keys", json={"name": XSS_KEY_NAME})
        assert response.status_code == 201

    async def nothing_ran() -> None:
        assert await page.evaluate("window.__xss === undefined")
        assert await page.locator('img[src="x"]').count() == 0
        assert await page.evaluate("[...document.scripts].every((s) => s.src && !s.textContent.includes('__xss'))")
        assert logged_in.dialogs == []

    await logged_in.open(f"memory?topic={seeded.xss_topic}")
    await expect(page.locator("#fragments tbody tr")).to_have_count(1)
    await expect(page.locator("#fragments")).to_contain_text('<img src="x" onerror=')
    await nothing_ran()
    await page.locator("#fragments tbody tr").first.click()
    await expect(page.locator("#fragment-content")).to_have_text(XSS_CONTENT)
    await logged_in.shot("fragment-xss-as-text")
    await nothing_ran()
    # The amend form holds it as a value, not as markup.
    assert await page.locator('#amend-form textarea[name="content"]').input_value() == XSS_CONTENT

    for view in ("dashboard", "keys", f"graph?topic={seeded.xss_topic}&limit=50"):
        await logged_in.open(view)
        await page.wait_for_load_state("networkidle")
        await nothing_ran()
    await expect(page.locator("svg.graph g.node")).to_have_count(1)
    await page.locator("svg.graph g.node").first.click()
    await expect(page.locator("#graph-node-content")).to_have_text(XSS_CONTENT)
    await logged_in.open("keys")
    await expect(page.locator("#keys-table")).to_contain_text(XSS_KEY_NAME)
    await nothing_ran()
    assert logged_in.errors == []


async def test_graph_draws_the_topic_as_nodes_and_links(logged_in: Console, seeded: Seeded) -> None:
    page = logged_in.page
    await logged_in.open("graph")
    await page.fill('#graph-form input[name="topic"]', seeded.topic)
    await page.click("#graph-form button[type=submit]")
    nodes = page.locator("svg.graph g.node")
    await expect(nodes).to_have_count(3)
    await expect(page.locator('svg.graph line.edge[data-relation="resolved_by"]')).to_have_count(1)
    # The layout spreads the nodes out (no two drawn on top of each other).
    spots = {await n.get_attribute("transform") for n in await nodes.all()}
    assert len(spots) == 3
    await page.locator(f'svg.graph g.node[data-id="{seeded.fix_id}"]').click()
    await expect(page.locator("#graph-node-content")).to_contain_text("Pointing the nginx upstream")
    await logged_in.shot("graph")
    await page.click("#open-fragment")
    await expect(page.locator("#fragment-content")).to_contain_text("Pointing the nginx upstream")


async def test_search_analytics_counts_the_recalls(logged_in: Console, stack: Stack, seeded: Seeded) -> None:
    page = logged_in.page
    async with admin_client(stack) as http:
        report = (await http.get("/memory/search-events", params={"days": 7})).json()
    await logged_in.open("search?days=7")
    box = page.locator("#search-events")
    await expect(box.locator("dl.kv").first).to_be_visible()
    assert report["totalSearches"] >= 1
    await expect(box).to_contain_text("total searches")
    await logged_in.shot("search-analytics")


async def test_sessions_list_detail_reflect_and_end(logged_in: Console, stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url, name="console-session-key")
    page = logged_in.page
    async with mcp_session(stack.mcp_url, raw) as s:
        await call(s, "remember", {
            "content": "A fragment stored inside the console's session test.", "topic": "console-session", "type": "fact"})
        async with admin_client(stack) as http:
            sessions = (await http.get("/sessions")).json()["sessions"]
        mine = next(x for x in sessions if x["keyId"] == key_id)
        await logged_in.open("sessions")
        row = page.locator("#sessions tbody tr", has_text="console-session-key")
        await expect(row).to_have_count(1)
        await logged_in.shot("sessions")
        await row.click()
        await expect(page.locator("#session-detail")).to_contain_text(mine["sessionId"])
        await page.click("#reflect-session")
        await expect(page.locator("#session-status")).to_contain_text("queued")
        await logged_in.shot("session-detail")
        await page.get_by_role("button", name="End session").click()
        await page.get_by_role("button", name="Click again to end it").click()
        await expect(page.locator("#session-status")).to_contain_text("Session ended")
    async with admin_client(stack) as http:
        detail = (await http.get(f"/sessions/{mine['sessionId']}")).json()
    assert detail["status"] == "ended"
    # The list's own actions: clean up expired sessions, reflect every unreflected one.
    await logged_in.open("sessions?status=all")
    await page.click("#cleanup-sessions")
    await expect(page.locator("#sessions-status")).to_contain_text("Cleanup completed")
    await page.click("#reflect-all")
    await expect(page.locator("#sessions-status")).to_contain_text("Reflect queued for")


async def test_consolidation_run_and_its_stage_report(logged_in: Console) -> None:
    page = logged_in.page
    await logged_in.open("maintenance")
    # The cycle runs for every tenant; this one only backfills and scans, so the suite's other
    # tenants are not decayed or merged under their tests.
    chosen = ("embedding_backfill", "passage_backfill", "anomalies")
    await page.click("details.stages > summary")
    for stage in chosen:
        await page.check(f'#consolidation-stages input[value="{stage}"]')

    # The first two polls answer "running" with the worker's progress shape (the real cycle of
    # three small stages finishes too fast to be seen), then the real answers come through.
    polls = 0

    async def first_polls_running(route: Any) -> None:
        nonlocal polls
        polls += 1
        if polls > 2:
            await route.continue_()
            return
        response = await route.fetch()
        run = await response.json()
        progress = {"stage": "passage_backfill", "done": 1, "total": 3, "stages": {"embedding_backfill": {"processed": 0}}}
        await route.fulfill(response=response, json={**run, "status": "running", "finishedAt": None, "result": None, "progress": progress})

    await page.route(re.compile(r".*/maintenance/runs/\d+$"), first_polls_running)
    await page.click("#run-consolidation")
    await expect(page.locator("#run-progress")).to_contain_text("2 of 3 · stage passage_backfill")
    report = page.locator("#run-report")
    await expect(report).to_have_attribute("data-status", "succeeded", timeout=180_000)
    for stage in chosen:
        await expect(report.locator("tbody tr", has_text=stage)).to_have_count(1)
    await expect(report.locator("tbody tr", has_text="semantic_dedup")).to_have_count(0)
    await expect(page.locator("#run-progress")).to_have_count(0)
    assert polls > 2
    await expect(report).to_contain_text("consolidate")
    await logged_in.shot("maintenance-consolidation")
    # The run is in the runs list and opens the same report from there.
    run_id = await report.get_attribute("data-run-id")
    await logged_in.open("maintenance")
    await page.locator("#runs tbody tr").filter(has=page.locator("td", has_text=re.compile(f"^{run_id}$"))).click()
    await expect(page.locator("#run-report")).to_have_attribute("data-run-id", str(run_id))
    await expect(page.locator("#run-report tbody tr", has_text="anomalies")).to_have_count(1)


async def test_fsck_progress_issues_and_apply(logged_in: Console, stack: Stack, seeded: Seeded) -> None:
    page = logged_in.page
    await logged_in.open("maintenance")
    await page.select_option('select[name="fsck_key"]', seeded.key_id)
    await page.click("#start-fsck")
    report = page.locator("#fsck-report")
    await expect(report).to_have_attribute("data-status", "succeeded", timeout=180_000)
    issue = page.locator("#fsck-issues tbody tr", has_text="prompt-injection")
    await expect(issue).to_have_count(1)
    await logged_in.shot("maintenance-fsck")
    await issue.locator('input[name="issue"]').check()
    await page.click("#fsck-apply-selected")
    await expect(page.locator("#maintenance-status")).to_contain_text("Applied")
    async with admin_client(stack) as http:
        assert (await http.get(f"/memory/fragments/{seeded.injection_id}")).status_code == 404
        assert (await http.get(f"/memory/fragments/{seeded.xss_id}")).status_code == 200  # only the chosen fix ran


async def test_logs_tail_level_and_search(logged_in: Console, stack: Stack) -> None:
    page = logged_in.page
    async with admin_client(stack) as http:
        files = (await http.get("/logs/files")).json()["files"]
        names = [f["name"] for f in files]
        assert "gateway.log" in names
        expected = (await http.get("/logs/read", params={"file": "gateway.log", "tail": 200})).json()["lines"]
    await logged_in.open("logs")
    await page.select_option('#log-form select[name="file"]', "gateway.log")
    await page.click("#log-form button[type=submit]")
    lines = page.locator("#log-lines .line")
    await expect(lines.first).to_be_visible()
    assert await lines.count() >= min(len(expected), 1)
    await logged_in.shot("logs")

    # tail: at most that many of the latest entries
    await page.select_option('#log-form select[name="tail"]', "100")
    await page.click("#log-form button[type=submit]")
    await expect(page.locator("#log-info")).to_contain_text("shown")
    assert 1 <= await lines.count() <= 100

    # level: only that level's lines
    await page.select_option('#log-form select[name="level"]', "info")
    await page.click("#log-form button[type=submit]")
    await expect(page.locator("#log-info")).to_contain_text("shown")
    classes = await lines.evaluate_all("(els) => els.map((e) => e.className)")
    assert classes and all("info" in c for c in classes)

    # search: a word of the latest entry, asked for in capitals (the search ignores case)
    word = next(w for w in re.findall(r"[A-Za-z]{5,}", expected[-1]["message"]))
    async with admin_client(stack) as http:
        found = (await http.get("/logs/read", params={"file": "gateway.log", "tail": 200, "search": word})).json()
    await page.select_option('#log-form select[name="level"]', "")
    await page.fill('#log-form input[name="search"]', word.upper())
    await page.click("#log-form button[type=submit]")
    await expect(page.locator("#log-info")).to_contain_text("shown", timeout=30_000)
    texts = await lines.all_inner_texts()
    assert texts and all(word.lower() in t.lower() for t in texts)
    # the tail chosen above (100) still applies; the file grows while the test reads it
    assert min(found["filtered"], 100) - 5 <= len(texts) <= 100
    await expect(page.locator("#log-stats")).to_contain_text("today")


# A value the console printed instead of rendering ("null", "[object Object]").
STRAY_TEXT = """[...document.querySelectorAll('#view, #view *')].flatMap((e) => [...e.childNodes])
  .filter((n) => n.nodeType === Node.TEXT_NODE && /^(null|undefined|\\[object Object\\]|NaN)$/.test(n.textContent.trim()))
  .map((n) => n.parentElement.outerHTML.slice(0, 120))"""


async def test_views_render_without_script_errors_or_stray_values(logged_in: Console) -> None:
    for view in ("dashboard", "keys", "memory", "search", "sessions?status=all", "logs", "graph", "maintenance"):
        await logged_in.open(view)
        name = view.split("?")[0]
        await expect(logged_in.page.locator(f'#view[data-view="{name}"]')).to_have_count(1)
        await logged_in.page.wait_for_load_state("networkidle")
        assert await logged_in.page.locator("#view .error").count() == 0, view
        assert await logged_in.page.evaluate(STRAY_TEXT) == [], view
    assert logged_in.errors == []


async def test_logs_view_says_where_logs_are_when_the_gateway_logs_to_stdout(browser: Any, stack: Stack) -> None:
    from tests.gateway.conftest import start_gateway

    proc, gateway = start_gateway(stack, "gateway-stdout-logs", 14, {"LOG_DIR": ""})
    try:
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(gateway.url + ADMIN)
        await page.fill("#master-key", stack.master_key)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("nav.sidebar")).to_be_visible()
        await page.goto(gateway.url + ADMIN + "#/logs")
        await expect(page.locator("#logs-note")).to_contain_text("LOG_DIR")
        await expect(page.locator("#log-lines .line")).to_have_count(0)
        await context.close()
    finally:
        proc.stop()
