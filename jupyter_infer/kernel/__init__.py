"""The kernel side: what a notebook imports. The client (``client``), the magics
(``magics``), the widgets (``widgets``), async agents (``agents``, ``tool_agent``) and the
launcher of a local Jupyter server (``launcher``)."""
