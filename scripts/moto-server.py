"""moto's server (AWS Glue Data Catalog and Glue Schema Registry, in memory), with Glue's
UpdateTable honouring its VersionId as AWS does.

Optimistic concurrency on Glue tables rests on that condition: a writer reads the table
(GetTable returns its VersionId), writes new metadata and calls UpdateTable with the
VersionId it read; AWS refuses with ConcurrentModificationException when another writer
updated the table in between. floe, iceberg-java and pyiceberg all commit that way. moto
5.2.5 accepts the VersionId and ignores it, so two writers racing would both "win" and one
commit would be lost silently. This wrapper adds the check, atomically, and nothing else.

Usage: moto-server.py -H 127.0.0.1 -p 5000   (the arguments of moto_server)
"""

import threading

from moto.glue.exceptions import GlueClientError
from moto.glue.responses import GlueResponse
from moto.server import main


class ConcurrentModificationException(GlueClientError):
    def __init__(self, message: str) -> None:
        super().__init__("ConcurrentModificationException", message)


_lock = threading.Lock()
_update_table = GlueResponse.update_table


def update_table(self):
    version = self.parameters.get("VersionId")
    with _lock:
        if version is not None:
            database = self.parameters.get("DatabaseName")
            name = self.parameters.get("TableInput", {}).get("Name")
            current = self.glue_backend.get_table(database, name).as_dict()["VersionId"]
            if str(current) != str(version):
                raise ConcurrentModificationException(
                    f"Table {database}.{name} is at version {current}, not {version}"
                )
        return _update_table(self)


GlueResponse.update_table = update_table

if __name__ == "__main__":
    main()
