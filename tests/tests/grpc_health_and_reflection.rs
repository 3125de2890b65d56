//! Stock gRPC tooling works: the standard health service reports the API serving, and server
//! reflection lists the Switchyard services.

use futures::StreamExt;
use switchyard_tests::{TestGateway, tls_channel};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_serving_and_reflection_lists_the_api() {
    let gateway = TestGateway::start(|config| config.quic.enabled = false).await;
    let addr = gateway.gateway().addr("grpc").unwrap();
    let channel = tls_channel(addr, &gateway.ca_pem()).await.unwrap();

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "switchyard.v1.Gateway"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".to_owned(),
        })
        .await;
    assert!(
        unknown.is_err(),
        "an unknown service is not reported serving"
    );

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("expected a service list, got {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"switchyard.v1.Gateway".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
}
