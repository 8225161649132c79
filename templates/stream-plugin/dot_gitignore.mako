__pycache__/
*.egg-info/
.venv/
.factstream/
.pytest_cache/
.mypy_cache/
.ruff_cache/
dist/
