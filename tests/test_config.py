"""Settings: file < env < CLI flags, always; every key and URL checked at start, one line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pg.yaml"
    path.write_text(text)
    return path


def test_env_equal_to_the_default_still_beats_the_file(tmp_path: Path, monkeypatch) -> None:
    config = write(tmp_path, "routing: {policy: round_robin}\n")
    monkeypatch.setenv("PREFIXGATE_ROUTING__POLICY", "prefix_affinity")  # the default value
    assert load_settings(config).routing.policy == "prefix_affinity"


def test_cli_beats_env_beats_file(tmp_path: Path, monkeypatch) -> None:
    config = write(tmp_path, "routing: {policy: round_robin, max_retries: 5}\nstate: memory\n")
    monkeypatch.setenv("PREFIXGATE_ROUTING__POLICY", "session")
    monkeypatch.setenv("PREFIXGATE_ROUTING__MAX_RETRIES", "2")  # the default value
    s = load_settings(config, routing={"policy": "least_load"})
    assert s.routing.policy == "least_load"
    assert s.routing.max_retries == 2


def test_unknown_file_key_names_the_key(tmp_path: Path) -> None:
    config = write(tmp_path, "routing: {polcy: session}\n")
    with pytest.raises(ConfigError, match=r"routing\.polcy"):
        load_settings(config)


def test_unknown_file_section_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="autoscaling"):
        load_settings(write(tmp_path, "autoscaling: {enabled: true}\n"))


@pytest.mark.parametrize("name", ["PREFIXGATE_ROUTING__POLCY", "PREFIXGATE_ROUTNG__POLICY", "PREFIXGATE_LISTN"])
def test_unknown_env_key_names_the_variable(monkeypatch, name: str) -> None:
    monkeypatch.setenv(name, "session")
    with pytest.raises(ConfigError, match=name):
        load_settings(None)


def test_secret_env_names_are_not_config_keys(monkeypatch) -> None:
    monkeypatch.setenv("PREFIXGATE_SALT_SECRET", "s3cret")  # tenants.cache_salt.secret_env's default
    assert load_settings(None).state == "memory"


@pytest.mark.parametrize("url", ["http://127.0.0.1:http://127.0.0.1:18001", "127.0.0.1:8000", "ftp://a:1",
                                 "http://:8000", "http://a:99999", "http://a b:1"])
def test_bad_backend_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=r"backends\[0\]\.url"):
        load_settings(None, backends=[{"url": url}])


@pytest.mark.parametrize("dns", ["", "bad_name!", "a..b", "-x.svc"])
def test_bad_discovery_name_is_refused(dns: str) -> None:
    with pytest.raises(ConfigError, match=r"discovery\.dns"):
        load_settings(None, discovery={"dns": dns})


def test_good_configuration_loads(tmp_path: Path) -> None:
    config = write(tmp_path, "backends: [{url: 'http://vllm-0.vllm:8000'}, {url: 'https://[::1]:8443/base'}]\n"
                             "discovery: {dns: vllm-headless.default.svc.cluster.local}\n")
    s = load_settings(config)
    assert [b.url for b in s.backends] == ["http://vllm-0.vllm:8000", "https://[::1]:8443/base"]


def serve(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", "0", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_cli_refuses_a_malformed_backend_with_one_line() -> None:
    r = serve("--backend", "http://127.0.0.1:http://127.0.0.1:18001")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "backends[0].url" in lines[0] and "http://127.0.0.1:http://127.0.0.1:18001" in lines[0]


def test_cli_refuses_an_unknown_config_key(tmp_path: Path) -> None:
    r = serve("--config", str(write(tmp_path, "backends: [{url: 'http://127.0.0.1:1'}]\nroutng: {}\n")))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "routng" in r.stderr


def test_cli_refuses_an_unknown_env_key() -> None:
    r = serve("--backend", "http://127.0.0.1:1", env={"PREFIXGATE_LIMITS__MAX_BODY": "1"})
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "PREFIXGATE_LIMITS__MAX_BODY" in r.stderr
