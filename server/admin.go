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

// AdminMethod answers one method of the admin service: any JSON-encodable
// value (the server is the daemon's transport and knows no type of it).
type AdminMethod func(ctx context.Context) (any, error)

// DaemonInfo describes the running daemon.
type DaemonInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Root    string `json:"root"`
	Address string `json:"address"`
	IDMap   string `json:"idmap"`
	PID     int    `json:"pid"`
}

func registerAdmin(srv *grpc.Server, methods map[string]AdminMethod) {
	desc := grpc.ServiceDesc{ServiceName: AdminService, HandlerType: (*any)(nil)}
	for name, h := range methods {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(&emptypb.Empty{}); err != nil {
					return nil, err
				}
				v, err := h(ctx)
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
	srv.RegisterService(&desc, nil)
}

// CallAdmin calls method of the admin service on conn and decodes the JSON
// reply into out.
func CallAdmin(ctx context.Context, conn grpc.ClientConnInterface, method string, out any) error {
	reply := &wrapperspb.BytesValue{}
	if err := conn.Invoke(ctx, "/"+AdminService+"/"+method, &emptypb.Empty{}, reply); err != nil {
		return err
	}
	return json.Unmarshal(reply.GetValue(), out)
}
