"""Receipts and units: the session receipt as one object (:mod:`.schema`), test records and the checks
table (:mod:`.table`), the files a receipt
session writes (:mod:`.files`, :mod:`.sidecar`), comparable units (:mod:`.units`, :mod:`.units_reader`),
``--resume`` (:mod:`.resume`), the machine (:mod:`.environment`), compare (:mod:`.compare`) and the
terminal tables (:mod:`.report`)."""
