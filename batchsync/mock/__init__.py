"""A local mock of the APIs batchsync meets: faults, quotas, pages, tokens that expire, and
OpenAI's, Anthropic's and Gemini's LLM and batch APIs with their limits. Run it with
``python -m batchsync.mock`` (``--help`` lists the routes). Nothing in the library imports it:
it stands beside the package, for trying a run and for the tests.

May import: nothing else of the package.
"""
