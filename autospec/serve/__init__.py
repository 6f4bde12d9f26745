"""`autospec serve`: an OpenAI-compatible completions server on the engine and the online
controller, reporting to `autospec daemon`.

    openai.py   the /v1/completions request (validated) and response shapes
    server.py   the aiohttp app: one decode thread, SSE streaming, telemetry and parameter pulls
"""
