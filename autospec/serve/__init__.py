"""`autospec serve`: an OpenAI-compatible completions server on the engine and the online
controller, reporting to `autospec daemon`.

    openai.py   /v1/completions and /v1/chat/completions requests (validated), response shapes
    server.py   the aiohttp app: one decode thread, SSE streaming, telemetry and parameter pulls
"""
