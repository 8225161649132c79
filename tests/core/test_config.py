"""Configuration: YAML file, environment overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from factstream.config import load_config
from factstream.errors import ConfigError

GOOD = """
deployment: example.org
instance_name: worker1
database:
  url: postgresql://postgres@db.internal:5432/facts
instance_map:
  main: {host: 10.0.0.1, replication_port: 9092, http_port: 8008}
  worker1: {host: 10.0.0.2, http_port: 8009}
stream_writers:
  events: [main, worker1]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "factstream.yaml"
    path.write_text(text)
    return path


def test_defaults_need_no_file_and_mean_one_embedded_instance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    settings = load_config(environ={})

    assert settings.instance_name == "main"
    assert settings.database.url is None and settings.redis.url is None
    assert settings.state_dir == tmp_path / ".factstream"
    assert settings.writers_for("account_data") == ["main"]


def test_file_values_are_read(tmp_path):
    settings = load_config(write(tmp_path, GOOD), environ={})

    assert settings.deployment == "example.org"
    assert settings.instance_map["main"].replication_port == 9092
    assert settings.instance_map["worker1"].host == "10.0.0.2"
    assert settings.writers_for("events") == ["main", "worker1"]
    assert settings.writers_for("to_device") == ["main"]
    assert settings.state_dir == tmp_path / ".factstream"


def test_environment_overrides_the_file(tmp_path):
    env = {"FACTSTREAM_DATABASE__URL": "postgresql://postgres@other/facts", "FACTSTREAM_INSTANCE_NAME": "main"}

    settings = load_config(write(tmp_path, GOOD), environ=env)

    assert settings.database.url == "postgresql://postgres@other/facts"
    assert settings.instance_name == "main"


def test_config_file_from_environment_variable(tmp_path):
    path = write(tmp_path, GOOD)

    assert load_config(environ={"FACTSTREAM_CONFIG": str(path)}).deployment == "example.org"


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*nope.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "instance_name: main\ninstance_map:\n  main: {host: [\n")

    with pytest.raises(ConfigError, match=r"is not valid YAML at line \d+, column \d+"):
        load_config(path, environ={})


def test_wrong_type_names_the_key_and_the_value(tmp_path):
    path = write(tmp_path, "instance_map:\n  main: {http_port: eighty}\n")

    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})

    assert "instance_map.main.http_port" in str(info.value)
    assert "'eighty'" in str(info.value)


def test_unknown_key_is_rejected_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"databse: unknown key"):
        load_config(write(tmp_path, "databse: {url: postgresql://x/y}\n"), environ={})


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"database.url \(from environment variable FACTSTREAM_DATABASE__URL\): must be a postgresql:// URL",
    ):
        load_config(environ={"FACTSTREAM_DATABASE__URL": "mysql://root@localhost/x"})


def test_writer_missing_from_instance_map_is_rejected(tmp_path):
    text = GOOD.replace("events: [main, worker1]", "events: [main, persister9]")

    with pytest.raises(ConfigError, match=r"stream_writers.events names 'persister9', missing from instance_map"):
        load_config(write(tmp_path, text), environ={})


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"must be a mapping of keys to values, not a list"):
        load_config(write(tmp_path, "- a\n- b\n"), environ={})


def test_malformed_config_file_gives_one_paragraph_and_exit_2(tmp_path, cli):
    write(tmp_path, "instance_map:\n  main: {http_port: [1, 2}\n")

    result = cli("migrate", "status")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: config file")
    assert "is not valid YAML at line 2" in result.stderr


def test_missing_config_file_fails_every_command(cli):
    result = cli("--config", "nope.yaml", "plugins")

    assert result.returncode == 2
    assert "config file 'nope.yaml' does not exist" in result.stderr


def test_replication_secret_comes_from_the_environment_and_is_never_shown(tmp_path):
    path = tmp_path / "factstream.yaml"
    path.write_text("replication:\n  secret: short-secret\n")

    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    settings = load_config(path, environ={"FACTSTREAM_REPLICATION__SECRET": "a-much-longer-secret-value"})

    assert "replication.secret: must be at least 16 characters long" in str(error.value)
    assert "short-secret" not in str(error.value)
    assert settings.replication.secret is not None
    assert settings.replication.secret.get_secret_value() == "a-much-longer-secret-value"
    assert "a-much-longer-secret-value" not in repr(settings)
    assert load_config(environ={}).replication.secret is None
