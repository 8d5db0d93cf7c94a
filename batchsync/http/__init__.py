"""Everything that speaks HTTP: the items as requests (``spec``, ``template``); the
transport that sends them (``transport``: the one ``Lane`` interface, ``send(request,
wall_end) -> Reply``, and the choice of lane for each request), its two lanes (``session``,
the requests way, which settles redirects, proxies and cookies; ``fastlane``, straight to
urllib3), what goes out and comes back (``exchange``) and the run's connections
(``connections``); the guards around an answer (``guard``, ``watchdog``, ``decode``),
cookies and origins, what an answer means for the retry (``classify``, ``retries``,
``quota``, ``provider``), pagination, hedging and refreshed credentials (``auth``).

May import: core, limits.
"""
