"""The async source of the savers (``AsyncAccordSaver``)."""
