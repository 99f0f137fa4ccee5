"""Date formats for the admin (FORMAT_MODULE_PATH): ISO dates, UTC, as /ops/ shows them."""

DATETIME_FORMAT = r"Y-m-d H:i:s \U\T\C"
SHORT_DATETIME_FORMAT = r"Y-m-d H:i:s \U\T\C"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
