"""Run the container deployment of compose.yaml for real, on docker or podman (issue 17).

``python -m deploy.stack up|check|down`` — see deploy/stack.py and docs/design/deployment.md.
"""
