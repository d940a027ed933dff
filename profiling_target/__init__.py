"""Real sample apps to profile (Flask under gunicorn, Starlette under uvicorn)."""
