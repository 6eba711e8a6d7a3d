package telemetry

import "os"

var osGetenv = os.Getenv
