"""A local mock of the APIs batchsync meets: faults, quotas, pages, tokens that expire, and
OpenAI's, Anthropic's and Gemini's LLM and batch APIs with their limits. Run it with
``python -m batchsync.mock`` (``--help`` lists the routes). Nothing in the library imports it.
"""
