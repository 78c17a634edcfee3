package natsbus

import (
	"fmt"
	"log/slog"
)

// serverLog routes the embedded nats-server's log to ours: warnings and
// errors at warn and error (a full disk, a slow consumer, a JetStream
// problem), notices at debug (they are routine: listening, ready), and
// nothing of its trace or debug output.
type serverLog struct{ log *slog.Logger }

func (l serverLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l serverLog) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLog) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLog) Debugf(string, ...any)           {}
func (l serverLog) Tracef(string, ...any)           {}
