"""The directory actor's service (service.py) and its parts."""

from actors.directory.service import DirectoryService

__all__ = ["DirectoryService"]
