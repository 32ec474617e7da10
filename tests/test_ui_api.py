"""The explorer's HTTP surface: the page and its assets under a CSP that allows nothing external,
`/hygiene/overview` (pod, display settings, reuse funnel), and assets that fetch only their own
origin. Over real loopback HTTP, the simulator as the engine."""

from __future__ import annotations

import re
import time

import httpx

from app.prefix.breakview import POD
from app.ui.page import asset, json_for_script, standalone_html


def test_page_and_assets_carry_a_csp_that_allows_only_this_origin(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim)
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        page, js, css = client.get("/ui"), client.get("/ui/app.js"), client.get("/ui/app.css")
        other = client.get("/ui/..%2Fconfig.py")
        missing = client.get("/ui/secrets.txt")
    for r in (page, js, css):
        assert r.status_code == 200
        csp = r.headers["content-security-policy"]
        assert csp.startswith("default-src 'self'") and "connect-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp and "*" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    assert page.headers["content-type"].startswith("text/html")
    assert js.headers["content-type"].startswith("text/javascript")
    assert css.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404 and other.status_code == 404


def test_assets_reference_nothing_external_and_never_parse_html() -> None:
    for name in ("index.html", "app.js", "app.css"):
        text = asset(name)
        urls = [u for u in re.findall(r"(?:https?:)?//[\w.-]+", text) if u != "http://www.w3.org"]
        assert urls == [], (name, urls)  # the SVG namespace name is no fetch
        assert "innerHTML" not in text and "outerHTML" not in text and "insertAdjacentHTML" not in text
        assert "eval(" not in text and "document.write" not in text
    fetched = re.findall(r'getJSON\("([^"]+)"', asset("app.js"))
    assert fetched and all(p.startswith("/hygiene/") for p in fetched)


def test_overview_reports_pod_settings_and_the_funnel_unknown_until_counted(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, ui={"grafana_url": "javascript:alert(1)", "refresh_s": 2})
    overview = httpx.get(proxy.url + "/hygiene/overview").json()
    assert overview["pod"] == POD and overview["show_text"] is False and overview["refresh_s"] == 2
    assert overview["grafana_url"] is None  # only absolute http(s) links reach the page
    assert overview["reuse"] == {"scope": "pod", "pod": POD, "available": None, "captured": None, "delivered": None,
                                 "beyond_available": None}
    body = {"model": "sim", "messages": [{"role": "user", "content": "hello there " * 40}], "max_tokens": 4}
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        proxy.settle()
        hook, deadline = proxy.services.prefix, time.monotonic() + 10
        while hook.processed < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        reuse = client.get("/hygiene/overview").json()["reuse"]
    assert reuse["available"] == proxy.sample("prefixgate_prefix_reuse_tokens_total", stage="available") > 0
    assert reuse["delivered"] == proxy.sample("prefixgate_prefix_reuse_tokens_total", stage="delivered")


def test_grafana_link_is_passed_through_when_http(sim, proxy_factory) -> None:
    proxy = proxy_factory(sim, ui={"grafana_url": "https://grafana.example.net/d/pg"})
    assert httpx.get(proxy.url + "/hygiene/overview").json()["grafana_url"] == "https://grafana.example.net/d/pg"


def test_embedded_data_cannot_close_its_script_element() -> None:
    raw = json_for_script({"t": "</script><script>alert(1)</script>&"})
    assert "<" not in raw and ">" not in raw and "&" not in raw
    page = standalone_html({"tenants": {"tenants": []}, "x": "</script>"})
    assert page.count("</script>") == 2  # the data block's and the inlined app's
    assert "default-src 'none'" in page and "unsafe-inline" not in page
