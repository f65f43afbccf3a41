"""The quickstart experiment (``envfactory quickstart``), its reader and its probe: the only room of
``agents`` that imports a demo family (FindLight)."""
