"""The dg project's defs folder: one folder per component instance (``ivm/defs.yaml``: the
``IvmProjectComponent`` of the project named by ``$IVM_PROJECT``, else the demo)."""
