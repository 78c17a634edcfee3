package api

import "context"

type callerKey struct{}

// withCaller marks ctx as a call that came on engine's scoped subject.
func withCaller(ctx context.Context, engine string) context.Context {
	return context.WithValue(ctx, callerKey{}, engine)
}

// CallerEngine is the engine a call came from when it arrived on an
// engine-scoped subject (EngineSubject); ok is false for member-scope
// calls, whose payload names the engine it acts for.
func CallerEngine(ctx context.Context) (engine string, ok bool) {
	engine, ok = ctx.Value(callerKey{}).(string)
	return engine, ok
}

// ActingEngine is the engine a call acts for. On an engine-scoped subject
// it is the subject's engine, and claimed (a payload field: engine_id,
// requester, consumer) must be empty or equal to it, else CodeForbidden;
// on a member-scope subject it is claimed.
func ActingEngine(ctx context.Context, field, claimed string) (string, error) {
	caller, ok := CallerEngine(ctx)
	if !ok {
		return claimed, nil
	}
	if claimed != "" && claimed != caller {
		return "", Errorf(CodeForbidden, "%s %q is not the calling engine %q (engines act only for themselves)", field, claimed, caller)
	}
	return caller, nil
}
