"""Everything that speaks HTTP: the items as requests (``spec``, ``template``), the
transports that send them (``transport``: ``requests`` and the fast lane), the guards around
an answer (``guard``, ``watchdog``, ``decode``), cookies and origins, what an answer means for
the retry (``classify``, ``retries``, ``quota``, ``provider``), pagination, hedging and
refreshed credentials (``auth``).

May import: core, limits.
"""
