"""The one exception the frontend raises for anything wrong with a model file."""


class ModelImportError(Exception):
    """A model file that hardwire cannot read, place or prove; the message says what and why."""
