package server

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// AdminService is the gRPC service the admin CLI uses for live state that
// containerd's snapshots API does not carry. Replies are JSON documents in
// a BytesValue: the service is internal to this binary, and JSON keeps it
// free of generated code while staying readable with grpcurl.
const AdminService = "grouped.v1.Admin"

// Admin is what the admin service exposes.
type Admin interface {
	Info(ctx context.Context) (DaemonInfo, error)
	// MappedParents lists the mapped parents (any JSON-encodable value:
	// the server is the snapshotter's transport and knows no type of it).
	MappedParents(ctx context.Context) (any, error)
	Orphans(ctx context.Context) ([]string, error)
	// RemoveOrphans removes what Orphans lists and returns what it removed.
	RemoveOrphans(ctx context.Context) ([]string, error)
	// Unremovable maps the orphans whose last removal failed to why.
	Unremovable(ctx context.Context) (map[string]string, error)
}

// DaemonInfo describes the running daemon.
type DaemonInfo struct {
	Version string `json:"version"`
	Root    string `json:"root"`
	Address string `json:"address"`
	IDMap   string `json:"idmap"`
	PID     int    `json:"pid"`
}

type adminHandler func(ctx context.Context, a Admin) (any, error)

var adminMethods = map[string]adminHandler{
	"Info":          func(ctx context.Context, a Admin) (any, error) { return a.Info(ctx) },
	"MappedParents": func(ctx context.Context, a Admin) (any, error) { return a.MappedParents(ctx) },
	// Views is MappedParents under its release-1 name, for CLIs of that
	// release talking to this daemon during an upgrade.
	"Views": func(ctx context.Context, a Admin) (any, error) { return a.MappedParents(ctx) },
	"Orphans": func(ctx context.Context, a Admin) (any, error) {
		return a.Orphans(ctx)
	},
	"Unremovable": func(ctx context.Context, a Admin) (any, error) {
		return a.Unremovable(ctx)
	},
	// Cleanup reports what it removed.
	"Cleanup": func(ctx context.Context, a Admin) (any, error) {
		return a.RemoveOrphans(ctx)
	},
}

func registerAdmin(srv *grpc.Server, a Admin) {
	desc := grpc.ServiceDesc{ServiceName: AdminService, HandlerType: (*any)(nil)}
	for name, h := range adminMethods {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(&emptypb.Empty{}); err != nil {
					return nil, err
				}
				v, err := h(ctx, a)
				if err != nil {
					return nil, err
				}
				data, err := json.Marshal(v)
				if err != nil {
					return nil, fmt.Errorf("encode %s reply: %w", name, err)
				}
				return wrapperspb.Bytes(data), nil
			},
		})
	}
	srv.RegisterService(&desc, a)
}

// CallAdmin calls method of the admin service on conn and decodes the JSON
// reply into out.
func CallAdmin(ctx context.Context, conn grpc.ClientConnInterface, method string, out any) error {
	reply := &wrapperspb.BytesValue{}
	if err := conn.Invoke(ctx, "/"+AdminService+"/"+method, &emptypb.Empty{}, reply); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(reply.GetValue(), out)
}
