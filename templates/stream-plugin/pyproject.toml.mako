[project]
name = "${dist}"
version = "0.1.0"
description = "${description_toml}"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["factstream", "msgspec", "pydantic>=2.7", "starlette"]

# How factstream finds the plugin: the entry point's name is the plugin's name.
[project.entry-points.factstream]
${name} = "${package}"

% if workspace:
# Part of a factstream checkout's uv workspace: factstream comes from the checkout.
[tool.uv.sources]
factstream = { workspace = true }

% endif
# The tests' tools: factstream's testing extra (pytest, pytest-asyncio, httpx), then linters.
# uv sync installs the group; with uv pip or pip: uv pip install "factstream[testing]"
[dependency-groups]
dev = ["factstream[testing]", "ruff>=0.6", "mypy>=1.11"]

[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["${package}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
asyncio_default_test_loop_scope = "function"

[tool.ruff]
line-length = 120

[tool.ruff.lint]
select = ["E", "F", "W", "I", "B", "UP"]

[tool.mypy]
strict = true
files = ["${package}"]
