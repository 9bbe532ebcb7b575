"""Interfaces: REST (api), MCP (mcp), the Python client (client), the CLI (cli)."""
